from . import not_built

command = not_built("eval", "issue 5")
