"""Prefect tasks and the plain numeric code they wrap (importable and testable without Prefect)."""
