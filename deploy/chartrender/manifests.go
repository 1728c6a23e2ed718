package main

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/ghodss/yaml"
)

// installOrder is Helm's releaseutil.InstallOrder: the kinds a release creates
// first come first; unknown kinds go last, alphabetically.
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList",
	"Service", "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

// sep is Helm's releaseutil manifest separator.
var sep = regexp.MustCompile("(?:^|\\s*\n)---\\s*")

// simpleHead is what Helm reads of every document to sort it (releaseutil.SimpleHead).
type simpleHead struct {
	Version  string `json:"apiVersion"`
	Kind     string `json:"kind,omitempty"`
	Metadata *struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata,omitempty"`
}

type manifest struct {
	source  string
	content string
	head    simpleHead
}

// SplitManifests splits one rendered template into its non-empty documents.
func SplitManifests(content string) []string {
	var docs []string
	for _, d := range sep.Split(strings.TrimSpace(content), -1) {
		if d == "" {
			continue
		}
		docs = append(docs, strings.TrimSpace(d))
	}
	return docs
}

// SortAndPrint turns rendered templates into `helm template`'s output: every
// document parsed (a YAML error fails the render, naming the template), regular
// manifests in install order by kind (then by template path), then hooks.
func SortAndPrint(files []File, skipTests bool) (string, error) {
	sorted := append([]File(nil), files...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var regular, hooks []manifest
	for _, f := range sorted {
		if strings.TrimSpace(string(f.Data)) == "" {
			continue
		}
		for _, doc := range SplitManifests(string(f.Data)) {
			m := manifest{source: f.Name, content: doc}
			if err := yaml.Unmarshal([]byte(doc), &m.head); err != nil {
				return "", fmt.Errorf("YAML parse error on %s: %v", f.Name, err)
			}
			hook := ""
			if m.head.Metadata != nil {
				hook = m.head.Metadata.Annotations["helm.sh/hook"]
			}
			if hook == "" {
				regular = append(regular, m)
				continue
			}
			if skipTests && isTestHook(hook) {
				continue
			}
			hooks = append(hooks, m)
		}
	}
	order := map[string]int{}
	for i, k := range installOrder {
		order[k] = i
	}
	less := func(a, b manifest) bool {
		oa, aok := order[a.head.Kind]
		ob, bok := order[b.head.Kind]
		switch {
		case !aok && !bok:
			return a.head.Kind < b.head.Kind
		case !aok:
			return false
		case !bok:
			return true
		}
		return oa < ob
	}
	sort.SliceStable(regular, func(i, j int) bool { return less(regular[i], regular[j]) })
	sort.SliceStable(hooks, func(i, j int) bool { return less(hooks[i], hooks[j]) })
	var b strings.Builder
	for _, m := range append(regular, hooks...) {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.source, m.content)
	}
	return b.String(), nil
}

func isTestHook(hook string) bool {
	for _, h := range strings.Split(hook, ",") {
		h = strings.TrimSpace(h)
		if h == "test" || h == "test-success" {
			return true
		}
	}
	return false
}
