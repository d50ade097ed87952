"""Trees, verification, acceptance rules, the generation loop, evaluation."""
