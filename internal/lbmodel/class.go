package lbmodel

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateClass checks a load balancer class given on the command line:
// KEP-1959 has spec.loadBalancerClass be a label-style key, and the
// apiserver refuses a Service whose class is not one, so a class that is
// not could never match a Service.
func ValidateClass(class string) error {
	if class == "" {
		return fmt.Errorf("the load balancer class must not be empty (ebb's own is %s)", ClassL4)
	}
	if errs := validation.IsQualifiedName(class); len(errs) > 0 {
		return fmt.Errorf("load balancer class %q is not a label-style key such as %s: %s", class, ClassL4, strings.Join(errs, "; "))
	}
	return nil
}
