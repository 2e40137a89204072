"""The one exception type for errors a user can act on.

The CLI prints an `EsfuseError` as a single line and exits non-zero; anything
else that escapes is a bug and keeps its traceback.
"""


class EsfuseError(Exception):
    """An error caused by input or environment, explained in its message."""


class StoreError(EsfuseError):
    """Elasticsearch could not be reached, refused a request, or holds bad data."""


class TreeError(EsfuseError):
    """A tree document is malformed or inconsistent."""
