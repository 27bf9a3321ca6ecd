"""Manifest signatures: publish signs, pull accepts only what a trusted key signed.

Why the manifest: it holds the sha256 of every file, and pull checks every file against it, so a
signature over ``manifest.json``'s bytes covers the whole artifact for the price of signing a
few kilobytes. The registry's ``quantgate.manifest_sha256`` tag already binds a version to its
manifest, but anyone who can write the registry can rewrite the tag; a signature needs the
publisher's private key, which the registry never sees.

Format: sigstore's ``model-signing`` library with an elliptic-curve key pair (P-256, P-384 or
P-521), offline (no Fulcio, no Rekor): a Sigstore bundle (DSSE envelope over an in-toto
statement naming the manifest's sha256), stored as ``manifest.sig`` beside ``manifest.json``
in the version's artifact directory; anyone can check one with ``model_signing verify key``.

Why deterministic ECDSA (RFC 6979): the same key and manifest give the same ``manifest.sig``
bytes, so the torrent built over it (``manifest.torrent``) and its info hash are the same on every
publish of the same content. Two concurrent publishes of one report resume the same run and
write the same store paths; with random nonces each wrote its own signature over the other's and
one failed its verification of the store's copy (seen in CI). A verifier cannot tell the two
kinds of signature apart, so versions signed before verify as they did.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from quantgate.publish.config import RegistryConfig
from quantgate.runtime.atomic import write_bytes
from quantgate.runtime.errors import SignatureError

SIGNATURE = "manifest.sig"  # beside manifest.json in the store's artifact directory
# A bundle quantgate writes is about 1.4 kB; anything past this is refused before it is read
# (a 600 MB manifest.sig cost 2 GB of memory in the parsers before its refusal).
MAX_SIGNATURE_BYTES = 64 * 1000


def key_id(key: Path) -> str:
    """A short name for a key pair (sha256 of the public key's DER), recorded on the versions it
    signed; the same from the private or the public key's PEM file."""
    from cryptography.hazmat.primitives import serialization

    data = Path(key).read_bytes()
    try:
        public = serialization.load_pem_private_key(data, password=None).public_key()
    except (ValueError, TypeError):
        public = serialization.load_pem_public_key(data)
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


def generate_key_pair(private_key: Path) -> Path:
    """A new P-256 key pair: ``private_key`` (PKCS#8 PEM, mode 0600) and ``<stem>.pub`` beside it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    public = Path(private_key).with_suffix(".pub")
    write_bytes(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_bytes(Path(private_key), pem, mode=0o600)  # last: its presence means the pair is whole
    return public


def signing_key(cfg: RegistryConfig) -> Path:
    """The private key publish signs with; a SQLite registry's own pair is made on first use."""
    key = cfg.signing_key
    if key is None:
        raise SignatureError(
            "QUANTGATE_SIGNING_KEY",
            "no signing key is configured for this registry, and publish signs every manifest",
            "set QUANTGATE_SIGNING_KEY (or signing_key in artifacts_registry/registry.yaml) to a PEM EC "
            "private key; give the fleet its public key in QUANTGATE_TRUSTED_KEYS",
        )
    if not key.is_file():
        if not cfg.generate_signing_key:
            raise SignatureError(key, "the signing key does not exist", "point QUANTGATE_SIGNING_KEY at it")
        generate_key_pair(key)
    return key


class _Rfc6979Key:
    """An EC private key whose ECDSA signatures use RFC 6979's deterministic nonce (same key and
    message, same bytes); everything else is the wrapped key's. model-signing's key signer calls
    ``sign(data, ECDSA(hash))`` on it."""

    def __init__(self, key) -> None:
        self._key = key

    def sign(self, data: bytes, algorithm) -> bytes:
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(algorithm.algorithm, deterministic_signing=True))

    def __getattr__(self, name: str):
        return getattr(self._key, name)


def _signer_config(key: Path):
    """model-signing's elliptic-key configuration, signing deterministically. The key signer keeps
    its key as ``_private_key`` (model-signing 1.x); a release that renames it is refused here
    rather than signing with random nonces (test_publish_paths_and_signatures checks two are one)."""
    from model_signing import signing

    config = signing.Config().use_elliptic_key_signer(private_key=key)
    signer: Any = getattr(config, "_signer", None)
    if getattr(signer, "_private_key", None) is None:
        raise RuntimeError("model-signing's key signer changed: it no longer keeps _private_key")
    signer._private_key = _Rfc6979Key(signer._private_key)
    return config


def sign(manifest: Path, cfg: RegistryConfig) -> bytes:
    """The signature (a Sigstore bundle, JSON) of ``manifest``'s bytes with the signing key; the
    same bytes each time for the same key and manifest."""
    key = signing_key(cfg)
    with tempfile.TemporaryDirectory(prefix="quantgate-sign-") as tmp:
        out = Path(tmp) / SIGNATURE
        try:
            _signer_config(key).sign(manifest, out)
        except ValueError as exc:
            raise SignatureError(
                key, f"cannot sign with this key ({exc})", "use a PEM EC P-256 key"
            ) from None
        return out.read_bytes()


def trusted_keys(cfg: RegistryConfig) -> tuple[Path, ...]:
    """The public keys pull accepts; a missing file or none configured is refused (fail closed)."""
    if not cfg.trusted_keys:
        raise SignatureError(
            "QUANTGATE_TRUSTED_KEYS",
            "no trusted keys are configured, so no artifact can be accepted",
            "set QUANTGATE_TRUSTED_KEYS (or trusted_keys in artifacts_registry/registry.yaml) to the "
            "publisher's public key file(s)",
        )
    for key in cfg.trusted_keys:
        if not key.is_file():
            raise SignatureError(
                key,
                "trusted public key file does not exist",
                "copy the publisher's public key there, or fix QUANTGATE_TRUSTED_KEYS",
            )
    return cfg.trusted_keys


def public_key_file(private_key: Path, directory: Path) -> Path:
    """The public half of ``private_key`` written as PEM under ``directory`` (to verify with it)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(private_key).read_bytes(), password=None)
    public = Path(directory) / "publisher.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return public


def too_large(where: str, size: int) -> SignatureError:
    """The refusal of a signature over ``MAX_SIGNATURE_BYTES`` (``size`` bytes), before reading it."""
    return SignatureError(
        where,
        f"the signature is {size:,} bytes, over the {MAX_SIGNATURE_BYTES:,}-byte limit (quantgate writes "
        "about 1,400); it was not read",
        "re-publish the artifact from its gate report; the store's copy was altered",
    )


def verify(
    manifest: Path,
    signature: bytes | None,
    cfg: RegistryConfig,
    where: str,
    *,
    keys: tuple[Path, ...] | None = None,
) -> str:
    """The ``key_id`` of the trusted key that signed ``manifest``'s bytes; SignatureError (naming
    ``where``) when unsigned, malformed, over ``MAX_SIGNATURE_BYTES``, or signed by no trusted key.

    ``keys``: verify with these public keys instead of the fleet's trusted keys (publish checks
    its own earlier statements with its own key).
    """
    from model_signing import verifying

    keys = keys if keys is not None else trusted_keys(cfg)
    if signature is None:
        raise SignatureError(
            where,
            "the artifact is not signed (no manifest.sig)",
            "re-publish it with a quantgate that signs, with a key the fleet trusts",
        )
    if len(signature) > MAX_SIGNATURE_BYTES:
        raise too_large(where, len(signature))
    with tempfile.TemporaryDirectory(prefix="quantgate-verify-") as tmp:
        sig = Path(tmp) / SIGNATURE
        sig.write_bytes(signature)
        reasons = []
        for key in keys:
            try:
                verifying.Config().use_elliptic_key_verifier(public_key=key).verify(manifest, sig)
                return key_id(key)
            except Exception as exc:  # noqa: BLE001  model-signing raises ValueError, or its parsers' own
                reasons.append(str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__)
    unknown = all("Key mismatch" in r for r in reasons)
    raise SignatureError(
        where,
        "signed by a key the fleet does not trust"
        if unknown
        else f"the signature does not verify ({reasons[0]})",
        "pull only artifacts published with a trusted key; add the publisher's public key to "
        "QUANTGATE_TRUSTED_KEYS if it should be trusted",
    )
