// Lint: ESLint's and typescript-eslint's recommended rules (type-checking is tsc's job in npm test;
// layout is Prettier's, checked beside it: scripts/check.sh).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', 'test-artifacts/', '.scratch/', 'src/proxy/http/dashboard/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: {
        process: 'readonly',
        console: 'readonly',
        Buffer: 'readonly',
        URL: 'readonly',
        fetch: 'readonly',
        setTimeout: 'readonly',
        clearTimeout: 'readonly',
        setInterval: 'readonly',
        clearInterval: 'readonly',
        setImmediate: 'readonly',
        AbortController: 'readonly',
        AbortSignal: 'readonly',
        Response: 'readonly',
      },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-empty': ['error', { allowEmptyCatch: true }],
      // Keys, tokens and headers are checked for control characters on purpose.
      'no-control-regex': 'off',
      // Prettier (npm run format) lays code out at 140 columns; a string or template may run past.
      'max-len': ['error', { code: 140, ignoreStrings: true, ignoreTemplateLiterals: true, ignoreRegExpLiterals: true, ignoreUrls: true }],
    },
  },
  {
    // The fence has two doors: src/fence/index.ts (the Fence the doors hold) and src/fence/admin.ts
    // (building it, the schema, the database). Nothing outside src/fence reaches past them.
    files: ['src/**/*.ts'],
    ignores: ['src/fence/**', 'src/election/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: '(^|/)fence/(?!(index|admin)\\.ts$)', message: 'Import the fence from src/fence/index.ts or src/fence/admin.ts.' },
            { regex: '(^|/)election/(?!index\\.ts$)', message: 'Import the election from its front door, src/election/index.ts.' },
          ],
        },
      ],
    },
  },
  {
    // The election has one front door (src/election/index.ts), and knows nothing of the fence or the proxy.
    files: ['src/election/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ regex: '(^|/)(fence|proxy)/', message: 'The election knows nothing of the fence or the proxy.' }] },
      ],
    },
  },
  {
    // The fence reaches the election through its front door only (and never the proxy).
    files: ['src/fence/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: '(^|/)election/(?!index\\.ts$)', message: 'Import the election from its front door, src/election/index.ts.' },
            { regex: '(^|/)proxy/', message: 'The fence knows nothing of the proxy.' },
          ],
        },
      ],
    },
  },
  {
    // Tests use the harness in tools/ and scripts/; the harness never reaches into test/.
    files: ['tools/**/*.ts', 'scripts/**/*.ts', 'bench/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ regex: '(^|/)test/', message: 'tools/, scripts/ and bench/ import nothing from test/.' }] },
      ],
    },
  },
);
