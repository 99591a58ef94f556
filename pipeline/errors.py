"""Errors that the command line reports as one clear message, without a traceback."""


class UserInputError(ValueError):
    """Bad user input: the message names the file, line, field or value, and the fix."""
