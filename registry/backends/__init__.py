"""The object-store backends of the registry: a folder, S3, the Hugging Face Hub, Azure Blob Storage."""
