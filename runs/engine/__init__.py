"""The engine: one run's RLM loop (conductor), the fanout of its sub-queries, and what they
read (policy, prompts, parsing, folding, the context)."""
