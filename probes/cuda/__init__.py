"""CUDA API uprobes (opt-in): launches, copies, syncs and allocations of GPU processes."""
