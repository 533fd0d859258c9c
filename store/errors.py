"""One exception type for every user-facing problem, so the CLI can print it as one line."""


class LayerwaveError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""
