"""The generation loop (verification, acceptance rules), prompt lookup and its combination with a learned drafter, and evaluation."""
