//! Istio's `trustdomain.Bundle`: the mesh's trust domain and its aliases. A policy principal
//! `<td>/ns/<ns>/sa/<sa>` whose trust domain is one of them (or `cluster.local`) matches every
//! one of them; `trustDomains` values naming one of them expand to all.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Bundle {
    pub(crate) trust_domains: Vec<String>,
}

impl Bundle {
    pub(crate) fn new(trust_domain: &str, aliases: &[String]) -> Bundle {
        let mut trust_domains = vec![trust_domain.to_owned()];
        trust_domains.extend(aliases.iter().cloned());
        Bundle { trust_domains }
    }

    /// Istio's `ReplaceTrustDomainAliases`.
    pub(crate) fn replace_trust_domain_aliases(&self, principals: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for principal in principals {
            let parts: Vec<&str> = principal.split('/').collect();
            // only full SPIFFE paths (`td/ns/x/sa/y`) not starting with `*` enforce a trust domain
            if parts.len() != 5 || parts[0] == "*" {
                out.push(principal.clone());
                continue;
            }
            let td = parts[0];
            if string_match(td, &self.trust_domains) || td == "cluster.local" {
                for alias in &self.trust_domains {
                    let replaced = if suffix_match(alias, td) {
                        principal.clone()
                    } else {
                        format!("{alias}/{}", parts[1..].join("/"))
                    };
                    if !out.contains(&replaced) {
                        out.push(replaced);
                    }
                }
            } else {
                out.push(principal.clone());
            }
        }
        out
    }

    /// Istio's `ExpandTrustDomainAliases`.
    pub(crate) fn expand_trust_domain_aliases(&self, values: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in values {
            let expanded = if self.trust_domains.contains(v) {
                self.trust_domains.clone()
            } else {
                vec![v.clone()]
            };
            for e in expanded {
                if !out.contains(&e) {
                    out.push(e);
                }
            }
        }
        out
    }
}

fn string_match(a: &str, list: &[String]) -> bool {
    list.iter().any(|s| {
        a == s || s == "*" || prefix_match(a, s) || prefix_match(s, a) || suffix_match(a, s) || suffix_match(s, a)
    })
}

fn prefix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_suffix('*').is_some_and(|p| a.starts_with(p))
}

fn suffix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_prefix('*').is_some_and(|p| a.ends_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn aliases_as_istio() {
        let b = Bundle::new("td1", &v(&["cluster.local", "some-td"]));
        assert_eq!(
            b.replace_trust_domain_aliases(&v(&["cluster.local/ns/a/sa/b"])),
            v(&["td1/ns/a/sa/b", "cluster.local/ns/a/sa/b", "some-td/ns/a/sa/b"])
        );
        assert_eq!(
            b.replace_trust_domain_aliases(&v(&["other/ns/a/sa/b"])),
            v(&["other/ns/a/sa/b"])
        );
        assert_eq!(
            b.replace_trust_domain_aliases(&v(&["*/ns/a/sa/b", "x"])),
            v(&["*/ns/a/sa/b", "x"])
        );
        assert_eq!(
            b.expand_trust_domain_aliases(&v(&["some-td", "x", "td1"])),
            v(&["td1", "cluster.local", "some-td", "x"])
        );
        // the mesh's own trust domain replaces `cluster.local` in policies written for the default
        let mesh = Bundle::new("example.org", &[]);
        assert_eq!(
            mesh.replace_trust_domain_aliases(&v(&["cluster.local/ns/a/sa/b"])),
            v(&["example.org/ns/a/sa/b"])
        );
    }
}
