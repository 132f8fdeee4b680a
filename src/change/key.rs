//! What things are keyed by: a resource (`ResourceKey`), an account-kind's lease, runs
//! and checkpoints (`Key`), a pause (`PauseKey`), each with one `Display`. A blank stored
//! text means something (the own account, every kind) only through these types.

/// Which account of a source a key is about. Stored as text: `""` is the sender's own
/// account (every single-account source's only one), anything else an account id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Account {
    /// The sender's own account (the API token's), the only one of a single-account
    /// source.
    #[default]
    Own,
    /// A registered account of a many-account source (a Connect account, a shop, an
    /// installation).
    Named(String),
}

impl Account {
    /// From its stored text (`""`: the own account).
    pub fn from_stored(text: impl Into<String>) -> Self {
        let text = text.into();
        if text.is_empty() {
            Self::Own
        } else {
            Self::Named(text)
        }
    }

    /// Its stored text (`""` for the own account).
    pub fn stored(&self) -> &str {
        match self {
            Self::Own => "",
            Self::Named(a) => a,
        }
    }

    pub fn is_own(&self) -> bool {
        matches!(self, Self::Own)
    }

    /// The account id, if it is a named account.
    pub fn named(&self) -> Option<&str> {
        match self {
            Self::Own => None,
            Self::Named(a) => Some(a),
        }
    }
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Own => f.write_str("own account"),
            Self::Named(a) => f.write_str(a),
        }
    }
}

/// Which kinds of a source a pause is about: all of them, or one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KindScope {
    Every,
    One(String),
}

impl KindScope {
    /// From its stored text in `reconcile_paused.kind` (`""`: every kind).
    pub fn from_stored(text: impl Into<String>) -> Self {
        let text = text.into();
        if text.is_empty() {
            Self::Every
        } else {
            Self::One(text)
        }
    }

    /// Its stored text (`""` for every kind; no kind is named `""`).
    pub fn stored(&self) -> &str {
        match self {
            Self::Every => "",
            Self::One(k) => k,
        }
    }

    /// The kind, if it is one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            Self::Every => None,
            Self::One(k) => Some(k),
        }
    }
}

/// What an operator paused: one kind of a source, or every kind of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseKey {
    pub source: String,
    pub kinds: KindScope,
}

impl std::fmt::Display for PauseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kinds {
            KindScope::Every => write!(f, "{} (every kind)", self.source),
            KindScope::One(k) => write!(f, "{}/{}", self.source, k),
        }
    }
}

/// What a lease, a run, a checkpoint or a watermark is about, and the scope of a read
/// of rows: one kind (a source's catch-up is a kind named `config::CATCHUP_KIND`) of one
/// account of one source. The change feed's consumers lease as [`Key::consumer`]. The
/// reserved kind and source names start with `$`, which no configured name can.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub source: String,
    pub account: Account,
    pub kind: String,
}

impl Key {
    /// A kind in the source's own account.
    pub fn new(source: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            account: Account::Own,
            kind: kind.into(),
        }
    }

    /// The same kind in `account` (its stored text: `""` is the own account).
    pub fn in_account(mut self, account: impl Into<String>) -> Self {
        self.account = Account::from_stored(account);
        self
    }

    /// The change feed's consumer `name` (its lease).
    pub fn consumer(name: impl Into<String>) -> Self {
        Self::new(CONSUMER_SOURCE, name)
    }

    /// The key of resource `id` of this kind.
    pub fn resource(&self, id: impl Into<String>) -> ResourceKey {
        ResourceKey::new(
            self.source.clone(),
            self.account.stored().to_string(),
            self.kind.clone(),
            id.into(),
        )
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.account {
            Account::Own => write!(f, "{}/{}", self.source, self.kind),
            Account::Named(a) => write!(f, "{}[{}]/{}", self.source, a, self.kind),
        }
    }
}

/// The lease "source" of the change feed's consumers, beside real sources.
const CONSUMER_SOURCE: &str = "$consumer";

/// A resource's primary key `(source, account, kind, id)`: owned (`ResourceKey`) or
/// borrowed (`ResourceKey<&str>`). Ordered by source, account, kind, id — the order in
/// which writers lock rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey<S = String> {
    pub source: S,
    pub account: S,
    pub kind: S,
    pub id: S,
}

impl<S> ResourceKey<S> {
    pub fn new(source: S, account: S, kind: S, id: S) -> Self {
        Self {
            source,
            account,
            kind,
            id,
        }
    }
}

impl ResourceKey<String> {
    pub fn as_ref(&self) -> ResourceKey<&str> {
        ResourceKey::new(&self.source, &self.account, &self.kind, &self.id)
    }
}

impl ResourceKey<&str> {
    pub fn to_owned(&self) -> ResourceKey {
        ResourceKey::new(
            self.source.into(),
            self.account.into(),
            self.kind.into(),
            self.id.into(),
        )
    }
}
