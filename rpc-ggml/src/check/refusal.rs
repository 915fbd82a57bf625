//! Why the validator refused a node: the rule that refused, and the message the connection's log
//! shows (unchanged by the rule's identity; the protocol has no error replies).

/// The rule that refused. Rules shared by many ops are named; an op's own check is named by the
/// template of its message (`ensure!`'s or `refuse!`'s format string, one per check site), so a
/// check needs no name of its own and two checks with the same template are the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The result starts inside a source's memory, elsewhere than at the source (`views.rs`).
    PartialOverlap,
    /// A tensor a kernel touches has elements overlapping in dim 0 or too many elements
    /// (`check_layout`).
    Layout,
    /// A view leaves the memory of the tensor it views (`check_view`).
    ViewBounds,
    /// The op has no rule here: unknown, custom, or not computable by ggml.
    UnsupportedOp,
    /// A source the op needs is missing.
    MissingSource,
    /// A source slot the op does not use is filled.
    ExtraSource,
    /// The result's shape is not the one the op's constructor makes (`ne_eq`).
    ResultShape,
    /// A tensor's type is not one the op takes (`ty_is`, `ty_in`).
    Type,
    /// `nb[0]` is not the element size where a kernel reads packed elements (`nb0_is_ts`).
    ElementStride,
    /// A result that must be fresh (contiguous) or in place is neither (`fresh`,
    /// `fresh_or_inplace`).
    FreshResult,
    /// The result's strides do not grow with the dimension (`strides_increase`).
    StridesIncrease,
    /// An op's own check, by its message template.
    Check(&'static str),
}

/// A refusal: its rule and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    rule: Rule,
    msg: String,
}

impl Refusal {
    pub(crate) fn new(rule: Rule, msg: String) -> Refusal {
        Refusal { rule, msg }
    }

    /// The rule that refused.
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// The same refusal, its message prefixed with `what` (which tensor or relation).
    pub(crate) fn about(self, what: &str) -> Refusal {
        Refusal {
            rule: self.rule,
            msg: format!("{what}: {}", self.msg),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<Refusal> for String {
    fn from(r: Refusal) -> String {
        r.msg
    }
}

/// A fixed message is its own template (`type_info(t).ok_or("k type")?`).
impl From<&'static str> for Refusal {
    fn from(msg: &'static str) -> Refusal {
        Refusal::new(Rule::Check(msg), msg.to_string())
    }
}
