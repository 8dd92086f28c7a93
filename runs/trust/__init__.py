"""Trust and money: verification of replies, attestations, budgets, receipts and the run's
accounts."""
