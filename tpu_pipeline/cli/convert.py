from . import not_built

command = not_built("convert", "issue 3")
