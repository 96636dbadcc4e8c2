"""Running compiled steps: clusters in order, variables as aliased state."""
