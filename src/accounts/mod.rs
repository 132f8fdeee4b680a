//! Many accounts behind one sender (SPEC "Many accounts per sender"): Stripe Connect
//! accounts, Shopify shops, GitHub App installations. So far: their credentials as
//! kept at rest ([`credential`]).

pub mod credential;
