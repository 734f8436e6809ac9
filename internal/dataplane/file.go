package dataplane

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// ParseConfig reads a YAML (or JSON) configuration, as `ebb lb --config`
// takes it, and validates it. Unknown fields are errors, so that a typo does
// not silently fall back to a default.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("parsing the configuration: %w", err)
	}
	valid, err := cfg.Validate()
	if err != nil {
		return Config{}, err
	}
	return valid, nil
}
