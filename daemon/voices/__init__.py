"""The voices on disk: ``herald voices`` and its download from Piper's catalog, and keeping a
running herald's catalog in step with its voice directories."""
