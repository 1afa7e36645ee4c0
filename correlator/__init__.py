"""The correlator: subscribes to every source, aligns, decides, and writes the store."""
