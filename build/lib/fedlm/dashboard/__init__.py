"""The live Streamlit dashboard over the run store (read-only SQLite)."""
