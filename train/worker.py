"""Entry point of each data-parallel process (launched by torchrun).

    torchrun --nproc-per-node 2 -m tpu_pipeline.train.worker '{"recipe": "digits_cnn", "out": "runs/d"}'
"""

from __future__ import annotations

import json
import sys

from tpu_pipeline.errors import PipelineError
from tpu_pipeline.train.distributed import report_failure
from tpu_pipeline.train.runner import run


def main() -> int:
    kwargs = json.loads(sys.argv[1])
    try:
        run(**kwargs)
    except PipelineError as e:
        report_failure(e)
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
