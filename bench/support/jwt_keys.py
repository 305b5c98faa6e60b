"""Signing keys and JWT minting for the auth tests and ``bench/auth.py``: one definition.

:class:`SigningKey` is a freshly generated RSA (RS256), EC P-256 (ES256) or Ed25519
(EdDSA) key with its ``kid``; :meth:`SigningKey.mint` signs claims with PyJWT's own
signing (independent of the server's verification path); :func:`jwks_document` is a
JWKS of public keys. Nothing here imports the ``whip`` package.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://idp.test/"
AUDIENCE = "whip-ingest-test"
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@dataclass
class SigningKey:
    """A private key, its algorithm and ``kid``; :attr:`jwk` is its public JWK."""

    algorithm: str
    kid: str
    private: PrivateKey = field(repr=False)

    @classmethod
    def generate(cls, algorithm: str, kid: str) -> SigningKey:
        private: PrivateKey
        if algorithm == "RS256":
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif algorithm == "ES256":
            private = ec.generate_private_key(ec.SECP256R1())
        elif algorithm == "EdDSA":
            private = ed25519.Ed25519PrivateKey.generate()
        else:
            raise ValueError(algorithm)
        return cls(algorithm, kid, private)

    @property
    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            body = jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            body = jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            body = jwt.algorithms.OKPAlgorithm.to_jwk(public, as_dict=True)
        return {**body, "kid": self.kid, "use": "sig", "alg": self.algorithm}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def mint(self, kid: str | None = "", **claims: Any) -> str:
        """A token signed by this key: standard claims (``sub`` studio-j, this test
        issuer and audience, valid for 5 minutes) updated by ``claims`` (a value of None
        removes the claim); ``kid`` "" is this key's, None leaves it out."""
        now = int(time.time())
        body: dict[str, Any] = {
            "sub": "studio-j",
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 300,
            "jti": uuid.uuid4().hex,  # every token distinct (the server caches verified ones)
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        headers = {} if kid is None else {"kid": kid or self.kid}
        return jwt.encode(body, self.private, algorithm=self.algorithm, headers=headers)


def jwks_document(*keys: SigningKey) -> bytes:
    return json.dumps({"keys": [k.jwk for k in keys]}).encode()


__all__ = ["AUDIENCE", "ISSUER", "SigningKey", "jwks_document"]
