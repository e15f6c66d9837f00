"""A remote read refused for good, told apart from a failure worth retrying: a missing object or
missing credentials in each client's own words, and for credentials what to set per protocol."""

from __future__ import annotations

__all__ = ["missing_credentials", "missing_object"]

# The clients' exceptions for "no credentials found" (botocore, google-auth, azure-identity) and
# the text they say it with where they raise something more general.
_TYPES = ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "CredentialUnavailableError",
          "ClientAuthenticationError")
_WORDS = ("Unable to locate credentials", "Could not automatically determine credentials")
# What to set, per protocol (storage_options go to the protocol's fsspec filesystem).
_HINTS = {
    "s3": "storage_options={'key': ..., 'secret': ...} (or an AWS profile, or AWS_ACCESS_KEY_ID and "
          "AWS_SECRET_ACCESS_KEY in the environment); storage_options={'anon': True} for a public bucket",
    "gs": "storage_options={'token': '<service account key>.json'} (or GOOGLE_APPLICATION_CREDENTIALS); "
          "storage_options={'token': 'anon'} for a public bucket",
    "az": "storage_options={'account_name': ..., 'account_key': ...} or {'connection_string': ...}",
    "hf": "storage_options={'token': ...} or HF_TOKEN in the environment (hf auth login)",
}
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}


def missing_credentials(e: BaseException, protocol: str) -> str | None:
    """What to set, where ``e`` says the client found no credentials for ``protocol``; else None.
    Not worth a retry: no try will find them."""
    for err in (e, e.__cause__, e.__context__):
        if err is not None and (type(err).__name__ in _TYPES or any(w in str(err) for w in _WORDS)):
            protocol = _ALIASES.get(protocol, protocol)
            return f"no credentials found for {protocol}:// ({type(err).__name__}): pass " + \
                _HINTS.get(protocol, "the filesystem's credentials in storage_options")
    return None


def missing_object(e: BaseException) -> bool:
    """A missing object said in a client's own words instead of FileNotFoundError (botocore's
    ``NoSuchKey`` where an s3fs release does not translate it): not retried."""
    response = getattr(e, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return isinstance(error, dict) and str(error.get("Code")) in ("NoSuchKey", "NoSuchBucket", "NotFound", "404")
