package e2eutil

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// GetIdentity sends GET url through client and decodes the echo pod's
// answer; a status other than 200 is an error.
func GetIdentity(ctx context.Context, client *http.Client, url string) (podserver.Identity, error) {
	var id podserver.Identity
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return id, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return id, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return id, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return id, json.NewDecoder(resp.Body).Decode(&id)
}

// GetOK sends GET url through client and wants 200 with the whole body
// read: what either kind of node's app answers (the echo's identity, or
// agnhost netexec's time), for loads that only count answers.
func GetOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return nil
}
