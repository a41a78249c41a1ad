"""The bundle format: what a bundle is (its manifest) and how a folder becomes one and back.

manifest              the manifest: key factors, the blob, every file with its digest, the signature
pack, pack_read       a folder into a deterministic .tar.zst, hashing every file on the way
unpack, unpack_write  a .tar.zst stream into a folder, only as far as its manifest allows
tarheader             the bounded tar-header reader unpacking needs
download_pipe         the bounded pipe from a download to the unpacking that consumes it
payload               pack and unpack of a whole payload, as the store and registries call them
"""
