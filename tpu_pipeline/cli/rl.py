from . import not_built

command = not_built("rl", "issue 5")
