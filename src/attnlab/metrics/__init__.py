"""attnlab.metrics: scores of model outputs (exact match, BLEU, chrF, caption scores, accuracy,
calibration)."""
