"""User-facing errors: one line that names the problem and the fix.

Anything raised as `DraftheadsError` is printed by the CLI as `error: <message>`
with exit status 2 and no traceback. Internal bugs stay ordinary exceptions.
"""


class DraftheadsError(Exception):
    """A problem with the user's input (recipe, paths, target), explained in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # keep it to one line

