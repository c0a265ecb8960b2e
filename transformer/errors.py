"""The one base class of errors a user can fix: the CLI prints their message on one line and exits 2."""


class UserError(Exception):
    """A problem with the user's input, config, data or files; the message names it and the fix."""
