"""The iot target's own pieces (TFLite Micro on a microcontroller): the firmware files
and the tensor arena the TFLM interpreter measured (firmware.py, written by the pipeline
next to a passed artifact), and that interpreter in a child process (_micro_worker.py,
launched by file from runtimes.run_micro, since TFLM aborts the process on a bad model).
The static int8 rewrites TFLM needs are quantize's (tflite_rewrites.py): every kind's
full-integer variant gets them.

Imports nothing from tpu_pipeline.convert; only the pipeline imports it, never a model
kind (pyproject's independence contract).
"""
