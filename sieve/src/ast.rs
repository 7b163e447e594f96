//! The compiled form of a script: commands and tests with their arguments
//! checked and typed, strings split into text and variable references.

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Var {
    Local(String),
    Global(String),
}

#[derive(Debug, Clone)]
pub(crate) enum Part {
    Text(String),
    Var(Var),
    /// `${0}`..`${9}` (and higher numbers, which are always empty).
    Match(usize),
}

/// A string argument: constant, or with variable references expanded at run
/// time (RFC 5229 §3).
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Const(String),
    Expand(Vec<Part>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comparator {
    Octet,
    Casemap,
    Numeric,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relation {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatchKind {
    Is,
    Contains,
    Matches,
    Count(Relation),
    Value(Relation),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Match {
    pub kind: MatchKind,
    pub comparator: Comparator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressPart {
    All,
    Local,
    Domain,
    User,
    Detail,
}

/// `:index n [:last]` (RFC 5260 §6): the n-th field of that name, counted from
/// the top or, with `:last`, from the bottom.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Index {
    pub n: u64,
    pub last: bool,
}

#[derive(Debug, Clone)]
pub(crate) enum BodyTransform {
    Raw,
    Text,
    Content(Vec<Value>),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Zone {
    /// The zone of the context's `now`.
    Local,
    /// Seconds east of UTC.
    Fixed(i32),
    /// The zone the date was written in (`:originalzone`).
    Original,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DatePart {
    Year,
    Month,
    Day,
    Date,
    Julian,
    Hour,
    Minute,
    Second,
    Time,
    Iso8601,
    Std11,
    Zone,
    Weekday,
}

#[derive(Debug, Clone)]
pub(crate) enum DuplicateKey {
    MessageId,
    Header(Value),
    UniqueId(Value),
}

#[derive(Debug)]
pub(crate) enum Test {
    True,
    False,
    Not(Box<Test>),
    AllOf(Vec<Test>),
    AnyOf(Vec<Test>),
    Header { m: Match, names: Vec<Value>, keys: Vec<Value>, index: Option<Index> },
    Address { m: Match, part: AddressPart, names: Vec<Value>, keys: Vec<Value>, index: Option<Index> },
    Envelope { m: Match, part: AddressPart, names: Vec<Value>, keys: Vec<Value> },
    Exists(Vec<Value>),
    Size { over: bool, limit: u64 },
    Body { m: Match, transform: BodyTransform, keys: Vec<Value> },
    String { m: Match, sources: Vec<Value>, keys: Vec<Value> },
    HasFlag { m: Match, vars: Vec<Var>, keys: Vec<Value> },
    MailboxExists(Vec<Value>),
    Date { m: Match, zone: Zone, index: Option<Index>, header: Value, part: DatePart, keys: Vec<Value> },
    CurrentDate { m: Match, zone: Zone, part: DatePart, keys: Vec<Value> },
    Duplicate { handle: Option<Value>, key: DuplicateKey, seconds: Option<u64>, last: bool },
    Spam { percent: bool, m: Match, key: Value },
    Virus { m: Match, key: Value },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagOp {
    Set,
    Add,
    Remove,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Modifier {
    Lower,
    Upper,
    LowerFirst,
    UpperFirst,
    QuoteWildcard,
    Length,
}

impl Modifier {
    /// RFC 5229 §4.1: higher precedence applies first.
    pub fn precedence(self) -> u8 {
        match self {
            Modifier::Lower | Modifier::Upper => 40,
            Modifier::LowerFirst | Modifier::UpperFirst => 30,
            Modifier::QuoteWildcard => 20,
            Modifier::Length => 10,
        }
    }
}

#[derive(Debug)]
pub(crate) struct VacationCmd {
    pub days: Option<u64>,
    pub seconds: Option<u64>,
    pub subject: Option<Value>,
    pub from: Option<Value>,
    pub addresses: Vec<Value>,
    pub mime: bool,
    pub handle: Option<Value>,
    pub reason: Value,
}

#[derive(Debug)]
pub(crate) enum Cmd {
    If {
        branches: Vec<(Test, Vec<Cmd>)>,
        otherwise: Option<Vec<Cmd>>,
    },
    Stop,
    Return,
    Keep {
        flags: Option<Vec<Value>>,
    },
    Discard,
    Redirect {
        address: Value,
        copy: bool,
    },
    FileInto {
        mailbox: Value,
        flags: Option<Vec<Value>>,
        copy: bool,
        create: bool,
    },
    Reject {
        reason: Value,
        extended: bool,
    },
    Flags {
        op: FlagOp,
        var: Option<Var>,
        flags: Vec<Value>,
    },
    Set {
        var: Var,
        modifiers: Vec<Modifier>,
        value: Value,
    },
    Vacation(Box<VacationCmd>),
    Include {
        name: String,
        global: bool,
        once: bool,
        optional: bool,
    },
    /// RFC 5463 §5: ends the run with an error.
    Error(Value),
    AddHeader {
        last: bool,
        name: Value,
        value: Value,
    },
    DeleteHeader {
        index: Option<Index>,
        m: Match,
        name: Value,
        patterns: Vec<Value>,
    },
}
