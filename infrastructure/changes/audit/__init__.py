"""The audit chain: rows that show tampering, their head file, fleet heads and verification."""
