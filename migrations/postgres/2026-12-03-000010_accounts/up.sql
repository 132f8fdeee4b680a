-- The accounts of many-account sources (Stripe Connect accounts, Shopify shops, GitHub
-- App installations): a delivery for an account that is not here, or not enabled, is
-- answered `ignored`.
CREATE TABLE accounts (
    source     TEXT        NOT NULL,
    account    TEXT        NOT NULL CHECK (account <> ''),
    enabled    BOOLEAN     NOT NULL DEFAULT true,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, account)
);
