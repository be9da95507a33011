"""The `cuco` subcommands, one module each: a docstring, ``HELP`` (one line for `cuco --help`),
``add_arguments(parser)`` and ``run(args) -> int`` (the exit code). `cuco_kit.cli` imports a command's module only
when that command runs, so a module may import what its command needs at its top.
"""
