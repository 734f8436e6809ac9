// Package config holds ebb's kustomize manifests; its test checks the
// RBAC they grant against what docs/security.md says ebb may do and why.
package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// writeVerbs change something; a ClusterRole that grants one on a whole
// resource (no resourceNames) grants it in every namespace.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "approve", "sign"}

// grant is one verb on one resource, cluster-wide, for one role.
type grant struct{ role, resource, verb string }

func (g grant) String() string { return fmt.Sprintf("%s may %s %s", g.role, g.verb, g.resource) }

// TestRBACGrantsOnlyWhatTheDocsJustify fails on any wildcard in ebb's
// roles, and on any cluster-wide write the table in docs/security.md does
// not list with a reason (or that it lists but the roles no longer grant):
// a new broad permission must be argued for where users read it.
func TestRBACGrantsOnlyWhatTheDocsJustify(t *testing.T) {
	files, err := filepath.Glob("rbac/*/role.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated roles under config/rbac: %v", err)
	}
	granted := map[grant]bool{}
	for _, f := range files {
		for _, r := range readRoles(t, f) {
			for _, rule := range r.rules {
				for _, field := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs, rule.ResourceNames, rule.NonResourceURLs} {
					if slices.Contains(field, "*") {
						t.Errorf("%s: %s grants a wildcard: %+v", f, r.name, rule)
					}
				}
				if !r.cluster || len(rule.ResourceNames) > 0 {
					continue
				}
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						for _, v := range rule.Verbs {
							if slices.Contains(writeVerbs, v) {
								granted[grant{r.name, qualified(g, res), v}] = true
							}
						}
					}
				}
			}
		}
	}
	documented := documentedGrants(t, "../docs/security.md")
	for _, g := range sorted(granted) {
		if !documented[g] {
			t.Errorf("%s cluster-wide, which docs/security.md (What ebb's service accounts may write) does not list with a reason: narrow it (resourceNames, a namespaced Role) or argue for it there", g)
		}
	}
	for _, g := range sorted(documented) {
		if !granted[g] {
			t.Errorf("docs/security.md says %s cluster-wide, which no role grants any more: remove the row", g)
		}
	}
}

type role struct {
	name    string
	cluster bool
	rules   []rbacv1.PolicyRule
}

func readRoles(t *testing.T, path string) []role {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []role
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch meta.Kind {
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &cr); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			out = append(out, role{cr.Name, true, cr.Rules})
		case "Role":
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &r); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			out = append(out, role{r.Name, false, r.Rules})
		case "":
		default:
			t.Fatalf("%s: unexpected kind %s", path, meta.Kind)
		}
	}
	return out
}

// qualified names a resource as the docs do: "nodes", "apps/deployments".
func qualified(group, resource string) string {
	if group == "" {
		return resource
	}
	return group + "/" + resource
}

// docRow is a row of the table: | role | `resource` | verbs | why |.
var docRow = regexp.MustCompile("^\\| *(ebb-[a-z-]+) *\\| *`([^`]+)` *\\| *([a-z, ]+?) *\\| *(.*?) *\\|$")

// documentedGrants reads the table that follows the section title.
func documentedGrants(t *testing.T, path string) map[grant]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## What ebb's service accounts may write")
	if !ok {
		t.Fatalf("%s has no section \"What ebb's service accounts may write\"", path)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	out := map[grant]bool{}
	for _, line := range strings.Split(section, "\n") {
		m := docRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		if m[4] == "" {
			t.Errorf("%s: the row for %s %s gives no reason", path, m[1], m[2])
		}
		for _, v := range strings.Split(m[3], ",") {
			out[grant{m[1], m[2], strings.TrimSpace(v)}] = true
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: the section \"What ebb's service accounts may write\" has no table rows", path)
	}
	return out
}

func sorted(m map[grant]bool) []grant {
	out := make([]grant, 0, len(m))
	for g := range m {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
