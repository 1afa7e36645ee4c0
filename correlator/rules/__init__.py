"""The rules engine: evaluating rules over signals (in memory or from the store), on a schedule."""
