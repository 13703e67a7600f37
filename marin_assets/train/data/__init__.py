"""What a phase trains on: Levanter token caches read in place (token_caches.py), opened and checked against the
model (sources.py), packed, shuffled and mixed into batches (batches.py), and the held-out loss on their
validation splits (heldout.py)."""
