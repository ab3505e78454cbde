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
    // The fence has one front door (src/fence/index.ts); nothing outside src/fence reaches past it.
    files: ['src/**/*.ts'],
    ignores: ['src/fence/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ regex: '(^|/)fence/(?!index\\.ts$)', message: 'Import the fence from its front door, src/fence/index.ts.' }] },
      ],
    },
  },
);
