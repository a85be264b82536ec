"""The verdict: whether an artifact may ship on a target, and why not.

Compatibility with the profile before anything runs (checks), the rows it is
judged on (eval_data), what each output means (output_kinds), parity against
PyTorch and the first diverging layer (parity), the task score with labels
(task_score), static int8's clipped ranges (int8_ranges), and the per-layer
error as a Model Explorer overlay (layer_errors). Nothing here writes an
artifact; it reads runtimes' outputs and the profiles."""
