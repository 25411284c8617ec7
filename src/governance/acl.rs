//! Who may do what: rules `{principal, resource, actions, effect, priority}`, highest priority
//! first, DENY before ALLOW at the same priority, and DENY when no rule matches.
//!
//! Pure: rules are parsed from JSON (the config file's and `PUT /admin/acl/{id}`'s bodies) and
//! a decision is a function of the rules and the request.

use serde::{Deserialize, Serialize};

/// What a request does to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Publish,
    /// Attach, poll, ack, nack, `Last-Event-ID` (and creating or removing a subscription).
    Subscribe,
    Request,
    Reply,
    Admin,
}

impl Action {
    const ALL: [(&'static str, Action); 5] = [
        ("PUBLISH", Action::Publish),
        ("SUBSCRIBE", Action::Subscribe),
        ("REQUEST", Action::Request),
        ("REPLY", Action::Reply),
        ("ADMIN", Action::Admin),
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    pub fn name(self) -> &'static str {
        Action::ALL[self as usize].0
    }
}

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Topic,
    Subscription,
    Agent,
    Admin,
}

impl Kind {
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Topic => "topic:",
            Kind::Subscription => "subscription:",
            Kind::Agent => "agent:",
            Kind::Admin => "admin",
        }
    }
}

/// A rule as written (JSON), kept to be listed back exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub principal: String,
    pub resource: String,
    pub actions: Vec<String>,
    pub effect: String,
    #[serde(default)]
    pub priority: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// A checked rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub spec: RuleSpec,
    kind: Kind,
    /// The resource's name pattern (empty for `admin`).
    pattern: String,
    actions: u8,
    effect: Effect,
}

/// Rule ids: `[A-Za-z0-9._:-]{1,128}`.
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

impl Rule {
    pub fn new(id: &str, spec: RuleSpec) -> Result<Rule, String> {
        if !valid_id(id) {
            return Err("rule ids are [A-Za-z0-9._:-]{1,128}".into());
        }
        if spec.principal.is_empty() || spec.principal.len() > 256 {
            return Err("principal must be a glob of 1-256 characters".into());
        }
        let (kind, pattern) = if spec.resource == "admin" {
            (Kind::Admin, String::new())
        } else {
            let kinds = [Kind::Topic, Kind::Subscription, Kind::Agent];
            let (kind, rest) = kinds
                .iter()
                .find_map(|k| spec.resource.strip_prefix(k.prefix()).map(|r| (*k, r)))
                .ok_or("resource must be topic:<glob>, subscription:<glob>, agent:<glob> or admin")?;
            if rest.is_empty() || rest.len() > 256 {
                return Err("a resource glob has 1-256 characters".into());
            }
            (kind, rest.to_owned())
        };
        if spec.actions.is_empty() {
            return Err("actions must name at least one of PUBLISH, SUBSCRIBE, REQUEST, REPLY, ADMIN".into());
        }
        let mut actions = 0u8;
        for a in &spec.actions {
            let (_, action) = Action::ALL
                .iter()
                .find(|(n, _)| n == a)
                .ok_or_else(|| format!("action {a:?} is not one of PUBLISH, SUBSCRIBE, REQUEST, REPLY, ADMIN"))?;
            actions |= action.bit();
        }
        let effect = match spec.effect.as_str() {
            "ALLOW" => Effect::Allow,
            "DENY" => Effect::Deny,
            other => return Err(format!("effect {other:?} is not ALLOW or DENY")),
        };
        Ok(Rule { id: id.to_owned(), kind, pattern, actions, effect, spec })
    }

    fn matches(&self, principal: &str, kind: Kind, name: &str, action: Action) -> bool {
        self.actions & action.bit() != 0
            && self.kind == kind
            && glob(&self.spec.principal, principal)
            && (kind == Kind::Admin || glob(&self.pattern, name))
    }
}

/// `*` matches any run of characters (none included), `?` any one; everything else itself.
/// Linear in practice, at most `pattern x text` steps (one backtrack point, both bounded).
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == b'?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// The rules in decision order.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    rules: Vec<Rule>,
}

impl Acl {
    pub fn new(mut rules: Vec<Rule>) -> Acl {
        // Highest priority first; DENY before ALLOW at the same priority; then by id, so the
        // order (and a listing) never depends on insertion.
        rules.sort_by(|a, b| {
            b.spec
                .priority
                .cmp(&a.spec.priority)
                .then((a.effect == Effect::Allow).cmp(&(b.effect == Effect::Allow)))
                .then(a.id.cmp(&b.id))
        });
        Acl { rules }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether any rule can let a principal administer (an ADMIN principal may exist).
    pub fn grants_admin(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.kind == Kind::Admin && r.effect == Effect::Allow && r.actions & Action::Admin.bit() != 0)
    }

    /// Whether `principal` may do `action` to the resource `kind:name`; with the deciding rule.
    pub fn decide(&self, principal: &str, kind: Kind, name: &str, action: Action) -> (bool, Option<&str>) {
        match self.rules.iter().find(|r| r.matches(principal, kind, name, action)) {
            Some(r) => (r.effect == Effect::Allow, Some(&r.id)),
            None => (false, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: &str, principal: &str, resource: &str, actions: &[&str], effect: &str, priority: i64) -> Rule {
        let spec = RuleSpec {
            principal: principal.into(),
            resource: resource.into(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            effect: effect.into(),
            priority,
        };
        Rule::new(id, spec).unwrap()
    }

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("orders.*", "orders.eu", true),
            ("orders.*", "orders", false),
            ("svc-?", "svc-a", true),
            ("svc-?", "svc-ab", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("**x", "yyx", true),
        ] {
            assert_eq!(glob(p, t), want, "{p} vs {t}");
        }
    }

    /// The obvious exponential matcher, as the reference.
    fn reference(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, _) => t.is_empty(),
            (Some(b'*'), _) => reference(&p[1..], t) || (!t.is_empty() && reference(p, &t[1..])),
            (Some(b'?'), Some(_)) => reference(&p[1..], &t[1..]),
            (Some(c), Some(d)) if c == d => reference(&p[1..], &t[1..]),
            _ => false,
        }
    }

    proptest::proptest! {
        #[test]
        fn glob_agrees_with_the_reference(p in "[ab*?]{0,8}", t in "[ab]{0,10}") {
            proptest::prop_assert_eq!(glob(&p, &t), reference(p.as_bytes(), t.as_bytes()));
        }
    }

    #[test]
    fn a_long_hostile_glob_stays_bounded() {
        // The classic exponential case for backtracking matchers; one backtrack point is linear-ish.
        let p = "a*".repeat(100) + "b";
        let t = "a".repeat(256);
        assert!(!glob(&p, &t));
    }

    #[test]
    fn default_deny_highest_priority_wins_deny_wins_ties() {
        let acl = Acl::new(vec![
            rule("r1", "svc-*", "topic:orders.*", &["PUBLISH"], "ALLOW", 10),
            rule("r2", "svc-bad", "topic:orders.*", &["PUBLISH"], "DENY", 10),
            rule("r3", "svc-bad", "topic:orders.eu", &["PUBLISH"], "ALLOW", 20),
        ]);
        assert_eq!(acl.decide("svc-a", Kind::Topic, "orders.us", Action::Publish), (true, Some("r1")));
        assert_eq!(acl.decide("svc-bad", Kind::Topic, "orders.us", Action::Publish), (false, Some("r2")));
        assert_eq!(acl.decide("svc-bad", Kind::Topic, "orders.eu", Action::Publish), (true, Some("r3")));
        assert_eq!(acl.decide("svc-a", Kind::Topic, "orders.us", Action::Subscribe), (false, None));
        assert_eq!(acl.decide("other", Kind::Topic, "orders.us", Action::Publish), (false, None));
        assert_eq!(acl.decide("svc-a", Kind::Subscription, "orders.us", Action::Publish), (false, None));
    }

    #[test]
    fn admin_rules_have_no_name() {
        let acl = Acl::new(vec![rule("ops", "ops-*", "admin", &["ADMIN"], "ALLOW", 0)]);
        assert!(acl.decide("ops-1", Kind::Admin, "", Action::Admin).0);
        assert!(!acl.decide("dev-1", Kind::Admin, "", Action::Admin).0);
    }

    #[test]
    fn bad_rules_are_named() {
        let spec = |resource: &str, actions: &[&str], effect: &str| RuleSpec {
            principal: "p".into(),
            resource: resource.into(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            effect: effect.into(),
            priority: 0,
        };
        assert!(Rule::new("x", spec("queue:a", &["PUBLISH"], "ALLOW")).unwrap_err().contains("resource"));
        assert!(Rule::new("x", spec("topic:a", &["EAT"], "ALLOW")).unwrap_err().contains("EAT"));
        assert!(Rule::new("x", spec("topic:a", &[], "ALLOW")).unwrap_err().contains("actions"));
        assert!(Rule::new("x", spec("topic:a", &["PUBLISH"], "MAYBE")).unwrap_err().contains("MAYBE"));
        assert!(Rule::new("bad id", spec("topic:a", &["PUBLISH"], "ALLOW")).unwrap_err().contains("ids"));
    }
}
