// Written by scripts/sync-version.js from ddp_magic/_version.py; do not edit.
export const VERSION = '0.1.0';
