"""TensorFlow side: trace, make pure, partition, and lower clusters to HLO."""
