from tpu_pipeline.cli import main

main()
