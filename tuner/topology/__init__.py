"""The topology domain: prefill/decode layouts, their simulation, and the recommendation's job."""
