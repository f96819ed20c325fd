"""What the checks share: their context, rows, verdicts, diagnoses, backward's contract, steps and second looks."""
