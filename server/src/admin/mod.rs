//! Admin HTTP: `/metrics`, `/healthz`, `/readyz`.
