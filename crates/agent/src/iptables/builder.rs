//! Istio's `IptablesRuleBuilder`: rules collected per IP family in the order they are added,
//! rendered as `iptables-restore` input the way Istio renders it (tables sorted by name, `-N` for
//! every Istio chain used or jumped to, then the `-A`/`-I` lines), and undone rule by rule.

use std::collections::{BTreeMap, BTreeSet};

/// Chains and targets iptables has built in: never created, never flushed.
pub(crate) const BUILT_IN_CHAINS_AND_TARGETS: [&str; 8] = [
    "INPUT",
    "OUTPUT",
    "FORWARD",
    "PREROUTING",
    "POSTROUTING",
    "ACCEPT",
    "RETURN",
    "DROP",
];

fn built_in(chain: &str) -> bool {
    BUILT_IN_CHAINS_AND_TARGETS.contains(&chain)
}

/// One rule: its table, its chain and the whole line (`-A CHAIN ...` or `-I CHAIN N ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub table: &'static str,
    pub chain: String,
    pub line: String,
}

impl Rule {
    /// The chain this rule jumps to, when the rule ends in `-j TARGET` (Istio's test for it).
    pub fn jump_target(&self) -> Option<&str> {
        let words: Vec<&str> = self.line.split_whitespace().collect();
        match words.as_slice() {
            [.., "-j", target] => Some(target),
            _ => None,
        }
    }

    /// The same rule as an `iptables -t T -D ...` argument list (Istio's `UndoRules`).
    pub fn delete_args(&self) -> Vec<String> {
        let mut words = self.line.split_whitespace();
        let op = words.next();
        let chain = words.next().unwrap_or_default();
        if op == Some("-I") {
            words.next(); // the insert position
        }
        ["-t", self.table, "-D", chain]
            .into_iter()
            .chain(words)
            .map(str::to_string)
            .collect()
    }
}

/// Collects rules for IPv4 and, when enabled, IPv6.
#[derive(Debug, Clone)]
pub struct RuleBuilder {
    enable_ipv6: bool,
    v4: Vec<Rule>,
    v6: Vec<Rule>,
}

fn rule(table: &'static str, chain: &str, line: String) -> Rule {
    Rule {
        table,
        chain: chain.to_string(),
        line,
    }
}

impl RuleBuilder {
    pub fn new(enable_ipv6: bool) -> Self {
        Self {
            enable_ipv6,
            v4: Vec::new(),
            v6: Vec::new(),
        }
    }

    pub fn append_v4(&mut self, table: &'static str, chain: &str, params: &str) {
        self.v4.push(rule(table, chain, format!("-A {chain} {params}")));
    }

    pub fn append_v6(&mut self, table: &'static str, chain: &str, params: &str) {
        if self.enable_ipv6 {
            self.v6.push(rule(table, chain, format!("-A {chain} {params}")));
        }
    }

    /// Appends to both families.
    pub fn append(&mut self, table: &'static str, chain: &str, params: &str) {
        self.append_v4(table, chain, params);
        self.append_v6(table, chain, params);
    }

    /// Appends a rule naming an address: `params(v4)` for IPv4, `params(v6)` for IPv6.
    pub fn append_versioned(
        &mut self,
        v4: &str,
        v6: &str,
        table: &'static str,
        chain: &str,
        params: impl Fn(&str) -> String,
    ) {
        self.append_v4(table, chain, &params(v4));
        self.append_v6(table, chain, &params(v6));
    }

    pub fn insert_v4(&mut self, table: &'static str, chain: &str, position: u32, params: &str) {
        self.v4
            .push(rule(table, chain, format!("-I {chain} {position} {params}")));
    }

    pub fn insert_v6(&mut self, table: &'static str, chain: &str, position: u32, params: &str) {
        if self.enable_ipv6 {
            self.v6
                .push(rule(table, chain, format!("-I {chain} {position} {params}")));
        }
    }

    /// Appends to one family.
    pub fn append_to(&mut self, family: Family, table: &'static str, chain: &str, params: &str) {
        match family {
            Family::V4 => self.append_v4(table, chain, params),
            Family::V6 => self.append_v6(table, chain, params),
        }
    }

    /// Inserts into one family.
    pub fn insert_to(&mut self, family: Family, table: &'static str, chain: &str, position: u32, params: &str) {
        match family {
            Family::V4 => self.insert_v4(table, chain, position, params),
            Family::V6 => self.insert_v6(table, chain, position, params),
        }
    }

    /// Inserts into both families.
    pub fn insert(&mut self, table: &'static str, chain: &str, position: u32, params: &str) {
        self.insert_v4(table, chain, position, params);
        self.insert_v6(table, chain, position, params);
    }

    pub fn build(self) -> RuleSet {
        RuleSet {
            v4: self.v4,
            v6: self.enable_ipv6.then_some(self.v6),
        }
    }
}

/// The rules for both families; `v6` is `None` when IPv6 is not enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    pub v4: Vec<Rule>,
    pub v6: Option<Vec<Rule>>,
}

impl RuleSet {
    /// `iptables-restore --noflush` input for IPv4.
    pub fn restore_v4(&self) -> String {
        restore(&self.v4)
    }

    /// `ip6tables-restore --noflush` input, when IPv6 is enabled.
    pub fn restore_v6(&self) -> Option<String> {
        self.v6.as_deref().map(restore)
    }

    /// The families' rules, IPv4 first.
    pub fn families(&self) -> impl Iterator<Item = (Family, &[Rule])> {
        std::iter::once((Family::V4, self.v4.as_slice())).chain(self.v6.as_deref().map(|r| (Family::V6, r)))
    }
}

/// An IP family: which iptables binaries a rule list goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Istio's `buildRestore`: per table (sorted by name), `-N` for each non-built-in chain in the
/// order rules first use it, then for chains only jumped to, then the rules in order.
pub fn restore(rules: &[Rule]) -> String {
    let mut tables: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for r in rules {
        if seen.insert((r.table, r.chain.as_str())) && !built_in(&r.chain) {
            tables.entry(r.table).or_default().push(format!("-N {}", r.chain));
        }
    }
    for r in rules {
        if let Some(target) = r.jump_target()
            && seen.insert((r.table, target))
            && !built_in(target)
        {
            tables.entry(r.table).or_default().push(format!("-N {target}"));
        }
    }
    for r in rules {
        tables.entry(r.table).or_default().push(r.line.clone());
    }
    let mut out = String::new();
    for (table, lines) in tables {
        out.push_str(&format!("* {table}\n"));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Istio's `buildCleanupRules` for rules in built-in chains: `-D` argument lists, last rule
/// first. Rules inside `ISTIO_*` chains go with their chain's flush.
pub(crate) fn undo_built_in(rules: &[Rule]) -> Vec<Vec<String>> {
    rules
        .iter()
        .rev()
        .filter(|r| !r.chain.starts_with("ISTIO_"))
        .map(Rule::delete_args)
        .collect()
}
