"""Reward functions for the rl tests, loaded through --reward module:function."""

import time


def starts_with_hash(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response starts with '#': a signal a random tiny policy finds often."""
    return 1.0 if solution_str.startswith("#") else 0.0


def raises_sometimes(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("#"):
        raise RuntimeError("reward exploded")
    return 1.0 if solution_str[:1] in "0123" else 0.0


def hangs_on_hash(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("#"):
        time.sleep(30)
    return 1.0 if solution_str[:1] in "0123" else 0.0


def returns_nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


def _char_sum(s: str) -> int:
    return sum(map(ord, s))


def odd_char_sum(data_source, solution_str, ground_truth, extra_info=None):
    """1 for about half of a random policy's responses, on any prompt (a signal for chat-model runs)."""
    return float(_char_sum(solution_str) % 2)


def raises_on_quarter(data_source, solution_str, ground_truth, extra_info=None):
    if _char_sum(solution_str) % 4 == 0:
        raise RuntimeError("reward exploded")
    return odd_char_sum(data_source, solution_str, ground_truth)


def hangs_on_quarter(data_source, solution_str, ground_truth, extra_info=None):
    if _char_sum(solution_str) % 4 == 0:
        time.sleep(30)
    return odd_char_sum(data_source, solution_str, ground_truth)
