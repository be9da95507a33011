"""User-facing errors: one line that names what was wrong and what to do, never a traceback."""


class CucoError(Exception):
    """An error whose message is meant for the user as it is (the CLI prints it as one line)."""


class BadInput(CucoError):
    """A file, argument or candidate the user supplied is not usable."""
