from . import not_built

command = not_built("train", "issue 4")
