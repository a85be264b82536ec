from . import not_built

command = not_built("generate", "issue 7")
