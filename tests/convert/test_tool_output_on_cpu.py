"""The converters' native output goes to a log file, and a temporary one does not outlive the call."""

from __future__ import annotations

import os

from tpu_pipeline.convert.tool_output import quiet_native


def test_native_output_goes_to_a_temporary_log_that_is_removed_on_exit():
    with quiet_native() as log:
        os.write(1, b"from a C++ logger\n")
        os.write(2, b"and its stderr\n")
        assert log.read_bytes() == b"from a C++ logger\nand its stderr\n"
    assert not log.exists()


def test_a_log_path_given_is_kept_and_appended_to(tmp_path):
    kept = tmp_path / "export.log"
    for line in (b"first\n", b"second\n"):
        with quiet_native(kept):
            os.write(2, line)
    assert kept.read_bytes() == b"first\nsecond\n"
