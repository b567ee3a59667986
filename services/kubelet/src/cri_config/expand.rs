//! `$(VAR)` references in env values, `command` and `args`, expanded as Kubernetes does.

/// `$(VAR)` expansion with Kubernetes semantics: `$$` → `$`, `$(NAME)` replaced when `vars`
/// knows NAME and left verbatim otherwise; an unterminated `$(` is left verbatim, as is a `$`
/// before anything else (or at the end).
pub fn expand(input: &str, vars: &impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            // `$` at the very end: nothing follows to make it an operator.
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..1 + close];
                    match vars(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 2..];
                }
                // Unterminated: keep `$(` and go on scanning after it, as Kubernetes does.
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(other) => {
                out.push('$');
                out.push(other);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(input: &str) -> String {
        let vars = |name: &str| match name {
            "A" => Some("alpha".to_owned()),
            "B" => Some("$(A)".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        expand(input, &vars)
    }

    #[test]
    fn defined_names_are_replaced_and_undefined_left_verbatim() {
        assert_eq!(ex("$(A)"), "alpha");
        assert_eq!(ex("x-$(A)-$(A)-y"), "x-alpha-alpha-y");
        assert_eq!(ex("$(NOPE)"), "$(NOPE)");
        assert_eq!(ex("[$(EMPTY)]"), "[]");
        assert_eq!(ex("$()"), "$()", "the empty name is undefined");
        assert_eq!(ex("plain text"), "plain text");
        assert_eq!(ex(""), "");
    }

    #[test]
    fn a_doubled_dollar_escapes() {
        assert_eq!(ex("$$(A)"), "$(A)");
        assert_eq!(ex("$$$(A)"), "$alpha");
        assert_eq!(ex("$$$$"), "$$");
        assert_eq!(ex("cost: 5$$"), "cost: 5$");
    }

    #[test]
    fn lone_and_trailing_dollars_stay() {
        assert_eq!(ex("$"), "$");
        assert_eq!(ex("a$"), "a$");
        assert_eq!(ex("$A"), "$A");
        assert_eq!(ex("$é$(A)"), "$éalpha", "multi-byte after a dollar");
        assert_eq!(ex("${A}"), "${A}", "only parentheses expand");
    }

    #[test]
    fn unterminated_references_stay_verbatim() {
        assert_eq!(ex("$(A"), "$(A");
        assert_eq!(ex("$("), "$(");
        assert_eq!(ex("x $(A y"), "x $(A y");
        assert_eq!(ex("$($(A)"), "$($(A)", "the name runs to the first closing parenthesis");
    }

    #[test]
    fn nested_looking_references_are_not_nested() {
        assert_eq!(ex("$(A$(B))"), "$(A$(B))");
        assert_eq!(ex("$(B)"), "$(A)", "a value is not expanded again");
        assert_eq!(ex("$(A))"), "alpha)");
    }
}
