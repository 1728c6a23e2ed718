package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
)

// MergeValueFiles reads -f files in order and deep-merges them (later files win,
// maps merge key by key), as Helm's values.Options.MergeValues does.
func MergeValueFiles(paths []string) (map[string]interface{}, error) {
	base := map[string]interface{}{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		cur, err := ReadValues(data)
		if err != nil {
			return nil, fmt.Errorf("failed to parse %s: %v", p, err)
		}
		base = mergeMaps(base, cur)
	}
	return base, nil
}

func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k]; ok {
				if bm, ok := bv.(map[string]interface{}); ok {
					out[k] = mergeMaps(bm, vm)
					continue
				}
			}
		}
		out[k] = v
	}
	return out
}

// CoalesceValues lays the user's values over the chart's defaults like Helm's
// chartutil.CoalesceValues: a key the user leaves out takes the default, maps merge
// recursively, a user null deletes the default, and a table never replaces a scalar
// or the reverse (Helm warns and keeps the user's value; so do we, on stderr).
func CoalesceValues(defaults, user map[string]interface{}) map[string]interface{} {
	dst := deepCopy(user)
	coalesceTables(dst, deepCopy(defaults), "")
	return dst
}

func coalesceTables(dst, src map[string]interface{}, prefix string) {
	for key, val := range src {
		full := key
		if prefix != "" {
			full = prefix + "." + key
		}
		dv, ok := dst[key]
		switch {
		case ok && dv == nil:
			delete(dst, key)
		case !ok:
			dst[key] = val
		default:
			sm, srcTable := val.(map[string]interface{})
			dm, dstTable := dv.(map[string]interface{})
			if srcTable && dstTable {
				coalesceTables(dm, sm, full)
			} else if srcTable && !dstTable {
				fmt.Fprintf(os.Stderr, "warning: cannot overwrite table with non table for %s (%v)\n", full, val)
			} else if dstTable && val != nil {
				fmt.Fprintf(os.Stderr, "warning: destination for %s is a table. Ignoring non-table value (%v)\n", full, val)
			}
		}
	}
}

// deepCopy copies a values tree through JSON (which keeps float64 numbers, strings,
// bools, nulls, maps and slices: exactly what ReadValues produces).
func deepCopy(v map[string]interface{}) map[string]interface{} {
	if v == nil {
		return map[string]interface{}{}
	}
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // values trees are JSON by construction
	}
	out := map[string]interface{}{}
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

// ValidateValues checks the coalesced values against values.schema.json with
// gojsonschema, converting them as Helm does (YAML -> JSON), and formats failures
// like Helm: one "- field: description" line per error.
func ValidateValues(chartName string, schema []byte, values map[string]interface{}) error {
	if schema == nil {
		return nil
	}
	valuesYAML, err := yaml.Marshal(values)
	if err != nil {
		return err
	}
	valuesJSON, err := yaml.YAMLToJSON(valuesYAML)
	if err != nil {
		return err
	}
	if bytes.Equal(valuesJSON, []byte("null")) {
		valuesJSON = []byte("{}")
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	if result.Valid() {
		return nil
	}
	var sb strings.Builder
	for _, desc := range result.Errors() {
		sb.WriteString(fmt.Sprintf("- %s\n", desc))
	}
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", chartName, sb.String())
}
