"""Example custom autograd Functions (correct ones and deliberately broken ones) used by the specs."""
